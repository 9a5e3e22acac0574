"""`python -m azprobe.dev.devconsul` == `azprobe devconsul` (the test harness starts it so)."""

from azprobe.dev.devconsul.cli import main

if __name__ == "__main__":
    main()
