"""The experiment file: its models and defaults (model, aws), the input boundary (input: bytes to one
YAML document, limits, credentials), loading with CLI overrides and file:line errors (loading,
errors), the grammar of names and URLs, and what the spec's nodes run on (hardware, catalog, pricing).

Nothing here runs a node or a target: it is read by both sides and imports only the contract."""
