"""The example kernels (the repository's `examples/` is a link to this directory, so the files
users read there are the ones installed with the package): `trn3emu demo --nki NAME` runs
`nki_NAME.py` from here, and `python examples/NAME.py` runs one from a checkout."""
