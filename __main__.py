"""``python -m fairclip``: the same command line as the ``fairclip`` script."""

from fairclip.sims.cli import main

if __name__ == "__main__":
    main()
