"""One adapter per measured queue, each exposing the same operations (see `base.Adapter`)."""
