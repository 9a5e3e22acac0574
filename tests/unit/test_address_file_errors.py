"""--address-file PATH that cannot be written: a ConfigError naming the flag (one line,
exit 2 in every daemon), never an OSError traceback, and no temporary file left behind."""

from __future__ import annotations

import pytest

from azprobe.daemon.address_file import write_address_file
from azprobe.errors import ConfigError


@pytest.mark.parametrize("name, problem", [("missing/addr", "does not exist"), ("file/addr", "is not a directory"),
                                           ("dir", "cannot write")])
def test_an_address_file_that_cannot_be_written_is_a_config_error_naming_the_flag(tmp_path, name, problem):
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    with pytest.raises(ConfigError) as exc:
        write_address_file(tmp_path / name, "127.0.0.1", 1234)
    assert exc.value.field == "--address-file" and problem in exc.value.problem and exc.value.exit_code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]  # no temporary file left behind
