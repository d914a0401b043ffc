"""A generated project and the template it comes from: the project on disk (`on_disk`), its record
`backendgen.json` (`record`), the template's manifest, contract and history, rendering, naming, merging."""
