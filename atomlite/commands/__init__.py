"""One module per `atomlite` command; atomlite.cli wires them into the parser."""
