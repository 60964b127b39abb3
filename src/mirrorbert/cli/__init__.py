"""The commands: `app.main` parses the command line, one module per command, each with its options dataclass;
`options` makes every flag from those fields. Nothing below this package imports it."""
