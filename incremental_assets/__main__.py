from incremental_assets.cli import entry

entry()
