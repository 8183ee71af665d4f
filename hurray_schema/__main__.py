"""``python -m hurray_schema`` runs the ``hurray-schema`` command line."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="hurray-schema")
