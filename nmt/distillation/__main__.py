import sys

from nmt.distillation.command import main

sys.exit(main())
