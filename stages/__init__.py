"""The pipeline's stages, one thin command line each: python -m stages.<name> --help."""
