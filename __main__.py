"""``python -m fairclip``: the same command line as the ``fairclip`` script."""

from fairclip.cli import main

if __name__ == "__main__":
    main()
