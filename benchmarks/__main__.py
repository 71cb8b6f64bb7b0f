from .throughput import cli

cli()
