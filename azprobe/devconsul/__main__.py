"""`python -m azprobe.devconsul` == `azprobe devconsul` (the test harness starts it so)."""

from azprobe.devconsul.cli import main

if __name__ == "__main__":
    main()
