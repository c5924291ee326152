"""Start-up hook folder for runtime migration (see sitecustomize.py); a package only so wheels ship it."""
