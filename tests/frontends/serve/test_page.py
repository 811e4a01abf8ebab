"""The `ootd serve` page in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium), at
1280x800 and at a phone's 390x844: no sideways scroll, every control reachable, the title on one or two lines; a
mask uploaded, or painted on the empty canvas over the photo, before any run; the history kept across runs, the
newest result in view (on a phone above the mask editor); "Edit this mask" keeps that run's seed; "download all"
is a zip of every run; bad uploads reported at once, no person found worded for the page; an outfit with a mask
per garment; no message naming a control that is not there; the notice for checkpoints that are not the released
ones. Screenshots land in the test's temporary folder (and in $OOTD_SCREENSHOTS when set)."""

from __future__ import annotations

import base64
import io
import os
import shutil
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[dev])")

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from ootd.models import ModelSource  # noqa: E402
from ootd.serve.limits import Limits  # noqa: E402
from tests.helpers.serving import live_server, tiny_config  # noqa: E402
from tests.helpers.synthetic import synthetic_preprocessor  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}

# Every visible control: inside the window's width once scrolled to, and the one under its own centre (a file
# input is reached through its label). Returns what is not.
UNREACHABLE = """
const out = [];
const controls = document.querySelectorAll('button, select, input, a, canvas, label.file-button');
for (const el of controls) {
  const target = el.classList.contains('visually-hidden') ? el.closest('label') : el;
  if (!target || target.offsetParent === null) continue;
  target.scrollIntoView({block: 'center', inline: 'nearest'});
  const r = target.getBoundingClientRect();
  const hit = document.elementFromPoint(r.left + r.width / 2, r.top + Math.min(r.height / 2, 20));
  const inside = r.left >= 0 && r.right <= window.innerWidth + 0.5;
  if (!inside || !(hit && (hit === target || target.contains(hit) || hit.contains(target))))
    out.push(`${target.tagName}#${target.id || target.textContent.trim().slice(0, 20)} `
             + `${Math.round(r.left)}..${Math.round(r.right)}`);
}
window.scrollTo(0, 0);
return out;
"""
LAYOUT = """
const h1 = document.querySelector('h1');
const line = parseFloat(getComputedStyle(h1).lineHeight) || h1.getBoundingClientRect().height;
return {scroll: document.documentElement.scrollWidth, width: window.innerWidth,
        titleLines: Math.round(h1.getBoundingClientRect().height / line)};
"""
ZIP = """
const done = arguments[arguments.length - 1];
zipBlob(allFiles()).then((blob) => blob.arrayBuffer()).then((buffer) => {
  let text = ''; const bytes = new Uint8Array(buffer);
  for (let i = 0; i < bytes.length; i += 8192) text += String.fromCharCode(...bytes.subarray(i, i + 8192));
  done(btoa(text));
});
"""


@pytest.fixture
def browser():  # noqa: ANN201
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/test.sh installs them as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def resize(driver, size: tuple[int, int]) -> None:  # noqa: ANN001
    """The page's own viewport at `size` (CSS pixels), as on a device of that size."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": size[0], "height": size[1], "deviceScaleFactor": 1, "mobile": size[0] < 500})


def shoot(driver, tmp_path: Path, name: str) -> None:  # noqa: ANN001
    """A screenshot of the whole page (its full height) at the current width."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.execute_script("return window.innerWidth")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": min(height, 6000), "deviceScaleFactor": 1, "mobile": width < 500})
    data = driver.get_screenshot_as_png()
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": SIZES["phone" if width < 500 else "desktop"][1], "deviceScaleFactor": 1,
        "mobile": width < 500})
    for folder in (tmp_path, os.environ.get("OOTD_SCREENSHOTS")):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / f"{name}.png").write_bytes(data)


def check_layout(driver, where: str) -> None:  # noqa: ANN001
    layout = driver.execute_script(LAYOUT)
    assert layout["scroll"] <= layout["width"], f"{where}: the page scrolls sideways: {layout}"
    assert layout["titleLines"] <= 2, f"{where}: the title takes {layout['titleLines']} lines"
    assert driver.execute_script(UNREACHABLE) == [], where


def runs(driver) -> list[dict]:  # noqa: ANN001
    """The history as shown: per run card, its number and the sources of its result images (shown)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#history .run')].map((run) => ({number: Number(run.dataset.number),"
        " about: run.querySelector('.run-about').textContent, images: [...run.querySelectorAll('img.result')]"
        ".filter((img) => img.complete && img.naturalWidth > 0).map((img) => img.src)}))")


def wait_runs(wait, count: int) -> None:  # noqa: ANN001
    wait.until(lambda d: len(runs(d)) == count and all(r["images"] for r in runs(d)))


def assert_newest_result_in_view(driver, size: str) -> None:  # noqa: ANN001
    """The newest run's card is on screen after its run; on a phone the results come before the mask editor
    (~900 px tall), so reaching them never means scrolling past it."""
    top, bottom, height = driver.execute_script(
        "const r = document.querySelector('#history .run').getBoundingClientRect(); "
        "return [r.top, r.bottom, window.innerHeight]")
    assert top < height and bottom > 0, (top, bottom, height)
    if size == "phone":
        results, editor = (driver.find_element(By.ID, i).rect["y"] for i in ("results", "editor"))
        assert results < editor, f"the results ({results} px down) come after the mask editor ({editor} px)"


def stroke(driver, canvas) -> None:  # noqa: ANN001
    ActionChains(driver).move_to_element_with_offset(canvas, -10, -40).click_and_hold() \
        .move_by_offset(30, 0).move_by_offset(0, 60).move_by_offset(-30, 0).release().perform()


def job_settings(driver, number: int) -> dict:  # noqa: ANN001
    return driver.execute_script(f"return runs[{number - 1}].job.settings")


@pytest.mark.slow
@pytest.mark.parametrize("size", list(SIZES), ids=list(SIZES))
def test_page_masks_before_a_run_history_seed_and_zip(browser, tmp_path: Path, tiny_tree: Path,  # noqa: ANN001
                                                      pipe_hd, example_images: dict[str, Path], size: str) -> None:
    config = tiny_config(tiny_tree, steps=1, resolution="384x512")
    resize(browser, SIZES[size])
    # automatic masks on tiny weights: synthetic pose and parsing
    with live_server(config, models=ModelSource(lambda model_type: pipe_hd, synthetic_preprocessor)) as live:
        browser.get(live.url)
        wait = WebDriverWait(browser, 60, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#category option"))
        wait.until(lambda d: "models loaded" in d.find_element(By.ID, "server-status").text)
        notice = browser.find_element(By.ID, "notice")
        wait.until(lambda d: notice.is_displayed())
        assert "does not run the released OOTDiffusion checkpoints" in notice.text
        assert notice.get_attribute("title").startswith("not the released OOTDiffusion models")
        check_layout(browser, f"{size}, empty page")
        shoot(browser, tmp_path, f"serve-{size}-empty")

        browser.find_element(By.CSS_SELECTOR, "[data-example=trousers]").click()  # an example sets its category
        wait.until(lambda d: d.find_element(By.ID, "garment-preview").is_displayed())
        assert Select(browser.find_element(By.ID, "category")).first_selected_option.text == "lower"
        browser.find_element(By.ID, "person-file").send_keys(str(example_images["person"]))
        browser.find_element(By.ID, "garment-file").send_keys(str(example_images["tshirt"]))
        Select(browser.find_element(By.ID, "category")).select_by_value("auto")  # classified by the server
        assert browser.find_element(By.ID, "model-type").text == "category and model: chosen from the garment photo"
        Select(browser.find_element(By.ID, "category")).select_by_value("upper")
        assert browser.find_element(By.ID, "model-type").text == "model: hd"
        assert browser.find_element(By.ID, "steps").get_attribute("value") == "1"  # the server's defaults
        assert browser.find_element(By.ID, "steps").get_attribute("max") == str(Limits.max_steps)

        # 1: a mask uploaded before any run
        canvas = browser.find_element(By.ID, "mask-canvas")
        wait.until(lambda d: canvas.is_displayed() and canvas.size["width"] > 50)
        browser.find_element(By.ID, "mask-file").send_keys(str(example_images["mask"]))
        wait.until(lambda d: d.find_element(By.ID, "mask-note").text == "mask: yours")
        check_layout(browser, f"{size}, inputs and mask chosen")
        browser.find_element(By.ID, "seed").send_keys("5")
        browser.find_element(By.ID, "run").click()
        wait_runs(wait, 1)
        assert job_settings(browser, 1)["mask"] == "uploaded" and job_settings(browser, 1)["seed"] == 5
        assert_newest_result_in_view(browser, size)
        # the page's default: the photo back, at its own size, only the garment's region changed
        assert browser.find_element(By.ID, "keep-unmasked").is_selected()
        assert job_settings(browser, 1)["keep_unmasked"] is True
        natural = browser.execute_script("const img = document.querySelector('#history .run img.result');"
                                         " return [img.naturalWidth, img.naturalHeight]")
        assert natural == list(Image.open(example_images["person"]).size)

        # 2: automatic (the seed field emptied: a random seed), history kept
        browser.find_element(By.ID, "mask-reset").click()
        browser.find_element(By.ID, "seed").clear()
        browser.find_element(By.ID, "run").click()
        wait_runs(wait, 2)
        first, second = sorted(runs(browser), key=lambda r: r["number"])
        assert job_settings(browser, 2)["mask"] == "auto" and first["images"] != second["images"]
        random_seed = browser.execute_script("return runs[1].job.seed")

        # 3: edit run 2's mask: its seed comes back into the Seed field; painted and run with it
        browser.find_elements(By.CSS_SELECTOR, '#history .run[data-number="2"] .edit-mask')[0].click()
        wait.until(lambda d: d.find_element(By.ID, "seed").get_attribute("value") == str(random_seed))
        assert f"seed {random_seed}" in browser.find_element(By.ID, "mask-state").text
        stroke(browser, canvas)
        browser.find_element(By.ID, "mask-rerun").click()
        wait_runs(wait, 3)
        assert job_settings(browser, 3)["mask"] == "uploaded"
        assert browser.execute_script("return runs[2].job.seed") == random_seed
        assert len(runs(browser)) == 3 and all(r["images"] for r in runs(browser)), "a run left the history"
        status = browser.find_element(By.ID, "server-status").text
        assert " x " not in status and "sdpa" in status, status
        assert not browser.find_element(By.ID, "error").is_displayed()
        check_layout(browser, f"{size}, three runs")
        shoot(browser, tmp_path, f"serve-{size}-runs")
        if size == "phone":
            resize(browser, (400, 844))
            check_layout(browser, "400 px, three runs")

        archive = zipfile.ZipFile(io.BytesIO(base64.b64decode(browser.execute_async_script(ZIP))))
        assert archive.testzip() is None
        names = archive.namelist()
        for number in (1, 2, 3):
            assert f"run-0{number}-seed" in " ".join(names)
        assert len([n for n in names if n.endswith("__0.png")]) == 3
        Image.open(io.BytesIO(archive.read(names[0]))).load()


@pytest.mark.slow
def test_page_paints_a_mask_on_the_empty_canvas_and_reports_bad_uploads_at_once(
        browser, tmp_path: Path, tiny_tree: Path, pipe_hd, example_images: dict[str, Path]) -> None:  # noqa: ANN001
    config = tiny_config(tiny_tree, steps=1, resolution="384x512")
    big = tmp_path / "big.png"
    Image.frombytes("RGB", (400, 400), os.urandom(400 * 400 * 3)).save(big)  # ~480 KB of noise
    text = tmp_path / "notes.png"
    text.write_text("this is not an image\n")
    resize(browser, SIZES["phone"])
    # pose and parsing of the tiny tree: they find nobody, so only a given mask can make a picture
    with live_server(config, limits=Limits(max_upload_bytes=256 * 1024),
                     models=ModelSource(lambda model_type: pipe_hd)) as live:
        browser.get(live.url)
        wait = WebDriverWait(browser, 60, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#category option"))
        error = browser.find_element(By.ID, "error")
        for bad, words in ((text, "cannot be read as an image"), (big, "at most 256 KB")):
            browser.find_element(By.ID, "person-file").send_keys(str(bad))
            wait.until(lambda d, words=words: error.is_displayed() and words in error.text)
            assert bad.name in error.text and not browser.find_element(By.ID, "person-preview").is_displayed()
        assert list((live.workdir / "jobs").iterdir()) == [], "a bad file was sent"
        shoot(browser, tmp_path, "serve-phone-bad-upload")

        browser.find_element(By.ID, "person-file").send_keys(str(example_images["person"]))
        browser.find_element(By.ID, "garment-file").send_keys(str(example_images["tshirt"]))
        wait.until(lambda d: not error.is_displayed())
        browser.find_element(By.ID, "run").click()  # automatic: nobody found, the page says what to do
        wait.until(lambda d: error.is_displayed() and "No person was found" in error.text)
        assert "--mask" not in error.text and "`mask`" not in error.text and "Paint" in error.text
        said(browser, "error")
        shoot(browser, tmp_path, "serve-phone-no-person")

        canvas = browser.find_element(By.ID, "mask-canvas")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
        stroke(browser, canvas)
        assert browser.find_element(By.ID, "mask-note").text == "mask: yours"
        browser.find_element(By.ID, "mask-rerun").click()
        wait_runs(wait, 1)
        assert job_settings(browser, 1)["mask"] == "uploaded"
        assert not error.is_displayed()
        mask_file = browser.execute_script("return runs[0].files.find((f) => f.kind === 'mask').url")
        assert mask_file.startswith("blob:")
        check_layout(browser, "phone, after a painted run")


# Every control a message names in quotes (“Second garment”) is on the page and shown; returns those that are not.
MISSING_NAMES = """
const names = [...arguments[0].matchAll(/“([^”]+)”/g)].map((m) => m[1]);
const shown = [...document.querySelectorAll('button, label, h2')].filter((e) => e.offsetParent !== null)
  .map((e) => e.textContent.trim().replace(/\\s+/g, ' '));
return names.filter((name) => !shown.some((text) => text === name || text.startsWith(name + ' ')));
"""


def said(driver, element_id: str) -> str:  # noqa: ANN001
    """A message of the page, checked: every control it names is there and shown, and no Reset (there is none)."""
    text = driver.find_element(By.ID, element_id).text
    assert "Reset" not in text, text
    assert driver.execute_script(MISSING_NAMES, text) == [], text
    return text


def choose_mask_of(driver, role: str) -> None:  # noqa: ANN001
    radio = driver.find_element(By.ID, f"mask-for-{role}")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", radio)
    radio.find_element(By.XPATH, "..").click()  # its label, as a person taps it
    assert radio.is_selected()


@pytest.mark.parametrize("size", [pytest.param("desktop"), pytest.param("phone", marks=pytest.mark.slow)])
def test_page_tries_on_an_outfit_with_a_mask_per_garment(browser, tmp_path: Path, tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                                         pipe_dc, example_images: dict[str, Path], size: str) -> None:
    """The tiny tree's pose finds nobody: automatic masks fail and the page says to paint each garment's; one mask
    of two is refused naming controls that are there; a mask per garment (painted, uploaded) makes the outfit;
    "Edit these masks" brings back both; on a phone the results come before the tall editor."""
    config = tiny_config(tiny_tree, steps=1, resolution="384x512")
    pipes = {"hd": pipe_hd, "dc": pipe_dc}
    width, height = Image.open(example_images["person"]).size
    legs = np.zeros((height, width), np.uint8)
    legs[height // 2:, width // 4:3 * width // 4] = 255
    Image.fromarray(legs, "L").save(tmp_path / "legs.png")
    resize(browser, SIZES[size])
    with live_server(config, models=ModelSource(lambda model_type: pipes[model_type.value])) as live:
        browser.get(live.url)
        wait = WebDriverWait(browser, 120, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#category option"))
        assert not browser.find_element(By.ID, "category2").is_displayed()
        browser.find_element(By.ID, "person-file").send_keys(str(example_images["person"]))
        browser.find_element(By.ID, "garment-file").send_keys(str(example_images["tshirt"]))
        Select(browser.find_element(By.ID, "category")).select_by_value("upper")
        assert not browser.find_element(By.ID, "mask-for").is_displayed()  # one garment: one mask
        browser.find_element(By.CSS_SELECTOR, "[data-example=trousers][data-for=garment2]").click()
        wait.until(lambda d: d.find_element(By.ID, "garment2-preview").is_displayed())
        assert Select(browser.find_element(By.ID, "category2")).first_selected_option.text == "lower"
        wait.until(lambda d: d.find_element(By.ID, "mask-for").is_displayed())
        assert browser.find_element(By.ID, "mask-note").text == "masks: automatic"
        browser.find_element(By.ID, "seed").send_keys("4")
        error = browser.find_element(By.ID, "error")

        browser.find_element(By.ID, "run").click()  # automatic: nobody found; paint each garment's mask
        wait.until(lambda d: error.is_displayed() and "No person was found" in error.text)
        assert "each garment" in said(browser, "error") and "“Second garment”" in error.text

        canvas = browser.find_element(By.ID, "mask-canvas")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
        stroke(browser, canvas)  # the garment's (the top's) mask
        assert browser.find_element(By.ID, "mask-note").text == "masks: one of two painted"
        assert "“Second garment”" in said(browser, "mask-state")
        jobs = len(list((live.workdir / "jobs").iterdir()))
        browser.find_element(By.ID, "run").click()
        wait.until(lambda d: error.is_displayed() and "for each garment or for neither" in error.text)
        said(browser, "error")
        assert len(list((live.workdir / "jobs").iterdir())) == jobs, "one mask of two was sent"

        choose_mask_of(browser, "garment2")  # the trousers' mask: uploaded
        assert browser.find_element(By.ID, "mask-for-garment2-state").text == "automatic"
        browser.find_element(By.ID, "mask-file").send_keys(str(tmp_path / "legs.png"))
        wait.until(lambda d: d.find_element(By.ID, "mask-note").text == "masks: yours")
        browser.find_element(By.ID, "run").click()
        wait_runs(wait, 1)
        assert not error.is_displayed(), error.text
        job = browser.execute_script("return runs[0].job")
        assert job["settings"]["mask"] == "uploaded" and job["seed"] == 4 and job["person_mask2"]
        names = browser.execute_script("return runs[0].files.map((f) => f.name)")
        assert any("tshirt-with-trousers" in name for name in names), names
        about = runs(browser)[0]["about"]  # the tiny tree's pose finds nobody: the figures say why there are none
        assert "outfit" in about and about.endswith(f" · {job['preservation']['summary']}"), about
        assert job["preservation"]["summary"].startswith("not measured: nobody found in the photo"), job
        assert_newest_result_in_view(browser, size)
        check_layout(browser, f"{size}, an outfit run")
        shoot(browser, tmp_path, f"serve-{size}-outfit")

        # both masks back in the editor, then run again with them
        choose_mask_of(browser, "garment")
        browser.find_element(By.ID, "mask-reset").click()  # the top's mask back to automatic
        browser.find_element(By.ID, "garment2-clear").click()  # and one garment again
        assert not browser.find_element(By.ID, "mask-for").is_displayed()
        browser.find_element(By.CSS_SELECTOR, '#history .run[data-number="1"] .edit-mask').click()
        wait.until(lambda d: d.find_element(By.ID, "garment2-preview").is_displayed())
        # the masks come back once their images have loaded (the previews show first)
        wait.until(lambda d: d.execute_script("return [editor.painted.garment, editor.painted.garment2]")
                   == [True, True])
        assert browser.find_element(By.ID, "mask-note").text == "masks: yours"
        assert Select(browser.find_element(By.ID, "category2")).first_selected_option.text == "lower"
        said(browser, "mask-state")
        browser.find_element(By.ID, "mask-rerun").click()
        wait_runs(wait, 2)
        again = browser.execute_script("return runs[1].job")
        assert again["seed"] == 4 and again["settings"]["mask"] == "uploaded" and again["person_mask2"]
        assert browser.execute_script("return runs[1].job.images.length") == 1
