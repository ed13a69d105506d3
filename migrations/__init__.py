"""jobqueue's Alembic environment and revisions; installed as the package
`jobqueue_migrations`, which `jobcore.migrate` runs (`jobqueue migrate`)."""
