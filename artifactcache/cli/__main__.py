"""`python -m artifactcache.cli`: the same as the `acache` script."""

from .app import main

main()
