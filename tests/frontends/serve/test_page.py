"""The `ootd serve` page in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium):
upload the example person and garment, pick a category, run, see the gallery and the mask; paint the mask and
rerun with it; a text file uploaded as the person shows a readable error. A screenshot lands in the test's
temporary folder (serve-page.png)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e .[serve])")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[dev])")

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from ootd.app.tryon.loader import ModelSource  # noqa: E402
from tests.helpers.serving import live_server, tiny_config  # noqa: E402
from tests.helpers.synthetic import synthetic_preprocessor  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
IMAGE_SHOWN = "return arguments[0].complete && arguments[0].naturalWidth > 0"


@pytest.fixture
def browser():  # noqa: ANN201
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/test.sh installs them as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1600"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def shown(driver, element) -> bool:  # noqa: ANN001
    return bool(driver.execute_script(IMAGE_SHOWN, element))


def results(driver) -> list[str]:  # noqa: ANN001
    """The sources of the gallery images shown so far (read in one script: the gallery is rebuilt per result)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#gallery img.result')]"
        ".filter((img) => img.complete && img.naturalWidth > 0).map((img) => img.src)")


@pytest.mark.slow
def test_page_try_on_mask_editor_and_error(browser, tmp_path: Path, tiny_tree: Path, pipe_hd,  # noqa: ANN001
                                           example_images: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(tiny_tree, steps=1, resolution="384x512")
    # an automatic mask on tiny weights: synthetic pose and parsing
    with live_server(config, models=ModelSource(lambda model_type: pipe_hd, synthetic_preprocessor)) as live:
        browser.get(live.url)
        wait = WebDriverWait(browser, 40, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException])
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#category option"))
        wait.until(lambda d: "models loaded" in d.find_element(By.ID, "server-status").text)
        browser.find_element(By.CSS_SELECTOR, "[data-example=trousers]").click()  # an example sets its category
        wait.until(lambda d: d.find_element(By.ID, "garment-preview").is_displayed())
        assert Select(browser.find_element(By.ID, "category")).first_selected_option.text == "lower"
        assert browser.find_element(By.ID, "model-type").text == "model: dc"
        browser.find_element(By.ID, "person-file").send_keys(str(example_images["person"]))
        browser.find_element(By.ID, "garment-file").send_keys(str(example_images["tshirt"]))
        Select(browser.find_element(By.ID, "category")).select_by_value("upper")
        assert browser.find_element(By.ID, "model-type").text == "model: hd"
        assert browser.find_element(By.ID, "steps").get_attribute("value") == "1"  # the server's defaults
        browser.find_element(By.ID, "run").click()

        wait.until(lambda d: results(d))
        mask = browser.find_element(By.ID, "mask-preview")
        wait.until(lambda d: shown(d, mask) and shown(d, d.find_element(By.ID, "masked-preview")))
        assert "seed" in browser.find_element(By.ID, "seed-used").text
        link = browser.find_element(By.CSS_SELECTOR, "#gallery a[download]")
        assert link.get_attribute("download") == "person__tshirt__0.png"
        canvas = browser.find_element(By.ID, "mask-canvas")
        wait.until(lambda d: canvas.is_displayed() and canvas.size["width"] > 50)
        assert not browser.find_element(By.ID, "error").is_displayed(), "an error is shown after a good run"
        browser.save_screenshot(str(tmp_path / "serve-page.png"))

        # paint a stroke over the person and run again with the edited mask
        first = results(browser)[0]
        ActionChains(browser).move_to_element_with_offset(canvas, -20, -30).click_and_hold() \
            .move_by_offset(40, 0).move_by_offset(0, 40).release().perform()
        browser.find_element(By.ID, "mask-rerun").click()
        wait.until(lambda d: (shown := results(d)) and shown[0] != first)
        assert browser.find_element(By.ID, "mask-note").is_displayed()
        job = browser.execute_script("return lastJob")
        assert job["settings"]["mask"] == "uploaded"

        # a text file as the person: a readable one-line error on the page, and the server still answers
        text = tmp_path / "notes.png"
        text.write_text("this is not an image\n")
        browser.find_element(By.ID, "person-file").send_keys(str(text))
        browser.find_element(By.ID, "run").click()
        error = browser.find_element(By.ID, "error")
        wait.until(lambda d: error.is_displayed() and error.text)
        assert "person image notes.png" in error.text and "\n" not in error.text
        browser.save_screenshot(str(tmp_path / "serve-page-error.png"))
