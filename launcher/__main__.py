"""`python -m launcher --config=configs/NAME.py` (or `podrun`): see
launcher/cli.py; `--help` lists the flags."""

from launcher import cli

if __name__ == '__main__':
  cli.run()
