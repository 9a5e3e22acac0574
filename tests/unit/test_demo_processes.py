import subprocess
import sys

from azprobe.dev.demo.runner import stop_strays


def test_stop_strays_stops_only_children_naming_the_work_dir(tmp_path):
    work_dir = tmp_path / "demo"
    work_dir.mkdir()
    # The argument after -c lands in sys.argv: a child "started from our configs".
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(work_dir / "ctl-1.toml")])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(tmp_path / "other")])
    try:
        stop_strays(work_dir)
        assert stray.wait(timeout=10) is not None
        assert bystander.poll() is None
    finally:
        for proc in (stray, bystander):
            proc.kill()
            proc.wait()
