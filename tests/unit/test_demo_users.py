"""The demo's live view of user traffic: figures from the load client's records and
Envoy's counters (azprobe.dev.demo.users.user_view), and how the view renders them."""

import json

from azprobe.dev.demo.view import UserView, ViewState, render, render_line
from azprobe.dev.demo.users import user_view


def test_user_view_reads_the_last_seconds_and_prefers_envoys_counters(tmp_path):
    records, admin = tmp_path / "requests.csv", tmp_path / "admin.jsonl"
    now = 100.0
    lines = [f"{now - 10 + i / 100:.3f},{250.0 if i < 500 else 2.0},200,{'az-b' if i < 500 else 'az-a'}\n"
             for i in range(1000)]
    lines.append(f"{now - 1:.3f},1000.0,504,-\n")
    records.write_text("".join(lines))
    admin.write_text("".join(json.dumps({"t": t, "zones": {"az-a": {"rq_total": a}, "az-b": {"rq_total": 500}}}) + "\n"
                             for t, a in ((now - 3.5, 350), (now - 2.5, 450), (now - 0.2, 700))))
    view = user_view(records, admin, ["az-a", "az-b"], now=now, window_s=3.0)
    assert view.split_source == "envoy" and view.split == {"az-a": 1.0, "az-b": 0.0}
    assert view.p99_ms == 2.0 and view.success_pct == 100.0 * 300 / 301  # one 504 of 301: under 1 %
    assert view.requests == 301
    assert user_view(tmp_path / "missing.csv", admin, ["az-a"], now=now) is None


def test_the_view_shows_users_p99_ok_and_split():
    state = ViewState(scenario="delay-loss", description="d", phase="fault",
                      users=UserView(3.0, 300, 12.5, 99.5, {"az-a": 0.5, "az-b": 0.0, "az-c": 0.5}))
    text = "\n".join(render(state, ansi=False, sick=["az-b"]))
    assert "P99 12.5 ms" in text and "ok 99.50 %" in text and "az-b  0.0%" in text
    line = render_line(state, 5.0)
    assert "users_p99=12.5ms" in line and "envoy_split=az-a:50.0%,az-b:0.0%,az-c:50.0%" in line
