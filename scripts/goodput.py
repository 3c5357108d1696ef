"""Where a job's time went: `podrun-goodput` (launcher/goodput_report.py)
from a checkout.

  python scripts/goodput.py WORKDIR [--out=WORKDIR/goodput.png]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launcher import goodput_report  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == '__main__':
  goodput_report.run()
