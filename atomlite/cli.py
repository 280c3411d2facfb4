"""The `atomlite` command: serve, generate, bench, eval, plan (each in atomlite.commands)."""
import logging

import click

from atomlite.commands.bench import bench
from atomlite.commands.eval import eval_command
from atomlite.commands.generate import generate
from atomlite.commands.options import VerboseGroup
from atomlite.commands.plan import plan
from atomlite.commands.serve import serve


@click.group(cls=VerboseGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log kernel choices and engine details.")
def main(verbose: bool):
    """atomlite: a small, fast, ROCm-first LLM inference runtime."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")


for command in (generate, serve, bench, eval_command, plan):
    main.add_command(command)


if __name__ == "__main__":
    main()
