"""Who may drive a live `ootd serve` on 127.0.0.1: Host names (DNS rebinding), other sites' pages (cross-origin
posts, --allow-origin with CORS), per-request limits on steps and samples, and what error messages give away."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
httpx = pytest.importorskip("httpx")

from typer.testing import CliRunner  # noqa: E402

from ootd import cli  # noqa: E402
from ootd.errors import UsageError  # noqa: E402
from ootd.serve.limits import Limits  # noqa: E402
from tests.helpers.serving import assert_one_line_error, files_for, live_server, pipes_factory, tiny_config, tryon_files  # noqa: E402

FAST = {"category": "upper", "steps": "1", "resolution": "384x512", "seed": "3"}


@pytest.fixture(scope="module")
def pipes(pipe_hd, pipe_dc) -> dict:  # noqa: ANN001
    return {"hd": pipe_hd, "dc": pipe_dc}


def jobs_on_disk(live) -> int:  # noqa: ANN001
    return len(list((live.workdir / "jobs").iterdir()))


def test_host_names_it_does_not_answer_to_are_refused(tiny_tree: Path, pipes: dict) -> None:
    with live_server(tiny_config(tiny_tree), models=pipes_factory(pipes)) as live:
        port = live.url.rstrip("/").rsplit(":", 1)[1]
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"10.1.2.3:{port}"):
            refused = httpx.get(live.url + "api/health", headers={"Host": host}, timeout=10)
            message = assert_one_line_error(refused, 421, host.split(":")[0], "--allow-host")
            assert "127.0.0.1" in message
            page = httpx.get(live.url, headers={"Host": host}, timeout=10)
            assert page.status_code == 421 and "<html" not in page.text
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}", "localhost"):
            assert httpx.get(live.url + "api/health", headers={"Host": host}, timeout=10).status_code == 200, host


def test_cross_site_posts_are_refused_same_origin_and_scripts_pass(tiny_tree: Path, pipes: dict,
                                                                    example_images: dict[str, Path]) -> None:
    with live_server(tiny_config(tiny_tree), models=pipes_factory(pipes)) as live:
        own = live.url.rstrip("/")
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Origin": own.replace("127.0.0.1", "localhost")},  # another origin, even on this machine
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
            for route in ("api/jobs", "api/tryon"):
                refused = httpx.post(live.url + route, files=tryon_files(example_images), data=FAST, headers=headers,
                                     timeout=30)
                assert_one_line_error(refused, 403, "--allow-origin")
        assert jobs_on_disk(live) == 0, "a refused request left a job behind"
        deleted = httpx.delete(live.url + "api/jobs/abc", headers={"Origin": "http://evil.example"}, timeout=10)
        assert_one_line_error(deleted, 403)
        # reading is not changing anything (and the browser keeps the answer from the other site's page)
        assert httpx.get(live.url + "api/health", headers={"Origin": "http://evil.example"}, timeout=10).is_success
        for headers in ({"Origin": own, "Sec-Fetch-Site": "same-origin"}, {}):  # the page itself; curl
            accepted = httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data=FAST, headers=headers,
                                  timeout=30)
            assert accepted.status_code == 202, accepted.text
            assert "access-control-allow-origin" not in accepted.headers


def test_allow_origin_lets_that_site_post_and_read(tiny_tree: Path, pipes: dict,
                                                   example_images: dict[str, Path]) -> None:
    from ootd.serve.origins import Access

    shop = "https://shop.example"
    access = Access.for_address("127.0.0.1", allow_origins=[shop + "/"])
    with live_server(tiny_config(tiny_tree), models=pipes_factory(pipes), access=access) as live:
        preflight = httpx.options(live.url + "api/jobs", timeout=10, headers={
            "Origin": shop, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == shop
        accepted = httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data=FAST, timeout=30,
                              headers={"Origin": shop, "Sec-Fetch-Site": "cross-site"})
        assert accepted.status_code == 202 and accepted.headers["access-control-allow-origin"] == shop
        refused = httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data=FAST, timeout=30,
                             headers={"Origin": "https://other.example"})
        assert_one_line_error(refused, 403, "other.example")


def test_access_rules() -> None:
    from ootd.serve.origins import Access, parse_origin

    loopback = Access.for_address("127.0.0.1")
    assert loopback.allows_host("localhost:7860") and loopback.allows_host(None)  # no Host: not a browser
    assert not loopback.allows_host("192.168.1.5:7860") and not loopback.allows_host("evil.example")
    everywhere = Access.for_address("0.0.0.0", allow_hosts=["tryon.example"])
    assert everywhere.allows_host("192.168.1.5:7860") and everywhere.allows_host("[fe80::1]:7860")
    assert everywhere.allows_host("TryOn.Example.:7860") and everywhere.allows_host(socket.gethostname())
    assert not everywhere.allows_host("evil.example:7860")
    assert Access.for_address("10.0.0.5").allows_host("10.0.0.5:80")
    assert not Access.for_address("10.0.0.5").allows_host("localhost")
    assert Access.for_address("127.0.0.1", allow_hosts=["*"]).allows_host("anything.example")
    assert loopback.allows_origin("http://127.0.0.1:7860", "127.0.0.1:7860")
    assert not loopback.allows_origin("http://127.0.0.1:7861", "127.0.0.1:7860")
    assert Access.for_address("::1", allow_origins=["*"]).allows_origin("https://a.example", "x")
    assert parse_origin("HTTPS://Shop.Example:8443/") == "https://shop.example:8443"
    for bad in ("shop.example", "ftp://shop.example", "https://shop.example/path", "https://"):
        with pytest.raises(UsageError, match="--allow-origin"):
            parse_origin(bad)


def test_bad_access_options_are_usage_errors(tiny_tree: Path) -> None:
    for args, word in ((["--allow-origin", "shop.example"], "--allow-origin"),
                       (["--allow-host", "http://x/y"], "--allow-host"),
                       (["--max-steps", "0"], "--max-steps"), (["--max-samples", "0"], "--max-samples"),
                       (["--steps", "60"], "--max-steps 50"), (["--samples", "8"], "--max-samples 4")):
        result = CliRunner().invoke(cli.app, ["serve", "--checkpoints", str(tiny_tree), *args])
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and word in lines[0], (args, lines)


def test_steps_and_samples_are_bounded_per_request(tiny_tree: Path, pipes: dict,
                                                   example_images: dict[str, Path]) -> None:
    with live_server(tiny_config(tiny_tree), models=pipes_factory(pipes)) as live:
        options = httpx.get(live.url + "api/options", timeout=10).json()
        assert options["limits"] == {"steps": Limits.max_steps, "samples": Limits.max_samples}
        for field, value in (("steps", "1000"), ("samples", "64"), ("steps", "51"), ("steps", "0"),
                             ("samples", "0"), ("steps", "-3")):
            refused = httpx.post(live.url + "api/tryon", files=tryon_files(example_images),
                                 data={**FAST, field: value}, timeout=30)
            top = Limits.max_steps if field == "steps" else Limits.max_samples
            # one message, with the bound that applies here, on either side of the range
            assert_one_line_error(refused, 422, f"{field} must be between 1 and {top} (this server's limit), "
                                                f"got {value}")
        assert jobs_on_disk(live) == 0
    with live_server(tiny_config(tiny_tree), limits=Limits(max_steps=2, max_samples=1),
                     models=pipes_factory(pipes)) as live:
        assert_one_line_error(httpx.post(live.url + "api/tryon", files=tryon_files(example_images),
                                         data={**FAST, "steps": "3"}, timeout=30), 422,
                              "steps must be between 1 and 2 (this server's limit), got 3")
        assert_one_line_error(httpx.post(live.url + "api/tryon", files=tryon_files(example_images),
                                         data={**FAST, "samples": "2"}, timeout=30), 422,
                              "samples must be between 1 and 1 (this server's limit), got 2")
        ok = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data={**FAST, "steps": "2"},
                        timeout=120)
        assert ok.status_code == 200, ok.text


def test_error_messages_name_no_server_paths(tmp_path: Path, example_images: dict[str, Path]) -> None:
    empty = tmp_path / "private" / "checkpoints"
    empty.mkdir(parents=True)
    with live_server(tiny_config(empty)) as live:
        response = httpx.post(live.url + "api/tryon", files=tryon_files(example_images), data=FAST, timeout=60)
        message = assert_one_line_error(response, 503, "cannot run this model", "<checkpoints>", "ootd download")
        assert str(tmp_path) not in message and "private" not in message, message
        assert str(live.workdir) not in message
        job = httpx.post(live.url + "api/jobs", files=tryon_files(example_images), data=FAST, timeout=60).json()
        while (status := httpx.get(live.url + f"api/jobs/{job['id']}", timeout=10).json())["state"] != "failed":
            assert status["state"] in ("queued", "running"), status
        assert status["status"] == 503 and str(tmp_path) not in status["error"]


def test_messages_are_worded_for_the_api(tiny_tree: Path, pipes: dict, example_images: dict[str, Path]) -> None:
    good = files_for({"person": example_images["person"], "garment": example_images["tshirt"]})
    with live_server(tiny_config(tiny_tree, model_type="hd"), models=pipes_factory(pipes)) as live:
        nobody = httpx.post(live.url + "api/tryon", files=good, data=FAST, timeout=120)  # tiny pose finds nobody
        message = assert_one_line_error(nobody, 400, "no person detected in person.png", "`mask`")
        lower = httpx.post(live.url + "api/tryon", files=good, data={**FAST, "category": "lower"}, timeout=30)
        message += assert_one_line_error(lower, 400, "dc model", "lower")
        assert "--" not in message, message  # no command-line option on a web page or in an API answer
        job = httpx.post(live.url + "api/jobs", files=good, data=FAST, timeout=30).json()
        while (status := httpx.get(live.url + f"api/jobs/{job['id']}", timeout=10).json())["state"] != "failed":
            assert status["state"] in ("queued", "running"), status
        assert status["needs_mask"] is True and status["status"] == 400  # the page offers its mask editor
