import sys

from gateway.cli import main

if __name__ == "__main__":  # not when a spawned worker imports the parent's main module
    sys.exit(main())
