"""The ``powertrip`` command line."""

from __future__ import annotations

import click

from powertrip.services.cli import export
from powertrip.services.cli.certs import certs
from powertrip.services.cli.common import OneLineErrors
from powertrip.services.cli.curtail import curtail
from powertrip.services.cli.experiment import experiment
from powertrip.services.cli.traces import traces
from powertrip.services.cli.up import up


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="powertrip")
def main() -> None:
    """PowerTrip: power- and network-aware federated training across datacenters."""


main.add_command(traces)
main.add_command(up)
main.add_command(curtail)
main.add_command(certs)
main.add_command(export.export_tensorboard_command)
main.add_command(experiment)


if __name__ == "__main__":
    main()
