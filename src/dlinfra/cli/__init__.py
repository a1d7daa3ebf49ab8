"""The `dlinfra` command line: thin commands over the domain modules."""
