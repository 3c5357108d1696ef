"""`python -m launcher --config=configs/NAME.py`: see launcher/cli.py."""

from launcher import cli

if __name__ == '__main__':
  cli.run()
