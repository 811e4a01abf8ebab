"""`python -m ootd`: the same command line as `ootd`."""

from ootd.cli import main

if __name__ == "__main__":
    main()
