// The queues page refreshes itself while its box is ticked; a job's page while the job is
// pending or processing (the server leaves the marker out once it finished, so the reloads
// stop there). The pages work without this.
(function () {
  "use strict";
  var unfinished = document.getElementById("refresh-while-unfinished");
  if (unfinished) {
    var every = Number(unfinished.getAttribute("data-refresh-seconds")) || 3;
    unfinished.hidden = false;
    var reload = function () {
      if (document.visibilityState === "visible") {
        window.location.reload();
      } else {
        setTimeout(reload, every * 1000);
      }
    };
    setTimeout(reload, every * 1000);
    return;
  }
  var box = document.getElementById("auto-refresh");
  if (!box) {
    return;
  }
  var key = "jobqueue.autoRefresh";
  var seconds = Number(box.getAttribute("data-refresh-seconds")) || 10;
  var timer = null;
  function schedule() {
    if (timer !== null) {
      clearTimeout(timer);
      timer = null;
    }
    if (box.checked) {
      timer = setTimeout(function () {
        if (document.visibilityState === "visible") {
          window.location.reload();
        } else {
          schedule();
        }
      }, seconds * 1000);
    }
  }
  var stored = null;
  try {
    stored = window.localStorage.getItem(key);
  } catch (e) {
    stored = null;
  }
  box.checked = stored !== "off";
  box.addEventListener("change", function () {
    try {
      window.localStorage.setItem(key, box.checked ? "on" : "off");
    } catch (e) {
      // Storage refused (private mode): the choice lasts for this page only.
    }
    schedule();
  });
  box.parentElement.hidden = false;
  schedule();
})();
