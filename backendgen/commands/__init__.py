"""What each command does to a project: add-op/remove-op (`addop`), `update`, `check`, `profile`, and the
consistency check every project-changing command runs first. `backendgen.api` is their public face."""
