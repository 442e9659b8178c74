from hybrid.train.main import cli

cli()
