"""The one-off tuning studies (see README.md): each folder a package, each script run from the
repository root as ``python -m experiments.<study>.<script>``; what they share is ``experiments.common``."""
