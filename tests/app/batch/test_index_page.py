"""A 2,000-pair batch's contact sheet in a real headless Chromium (Debian's chromium + chromium-driver, driven by
Selenium, as tests/frontends/serve/test_page.py does), at 1280x800 and as a 390x844 phone: the front page, a page
of the grid and an error page open, show their pictures and placeholders, and never scroll sideways (only the grid
scrolls, in its own box). Screenshots land in the test's temporary folder (sheet-*.png)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image

from ootd.app.batch.index import write_index
from ootd.app.batch.pages import Heading
from ootd.app.batch.pairs import Pair
from ootd.app.batch.report import PairReport
from ootd.settings import Category

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[dev])")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
SIZES = {"desktop": (1280, 800, False), "phone": (390, 844, True)}
SHOWN = "return [...document.images].filter(i => i.complete && i.naturalWidth > 0).length"
SIDEWAYS = "return document.documentElement.scrollWidth - window.innerWidth"
GRID_SCROLLS = ("const g = document.querySelector('.grid'); "
                "return g ? [g.scrollWidth > g.clientWidth, getComputedStyle(g).overflowX] : null")

pytestmark = pytest.mark.slow  # a browser per window size


def browser(width: int, height: int, phone: bool):  # noqa: ANN201
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    if phone:  # a phone's browser: the page's viewport meta decides the layout width
        options.add_experimental_option("mobileEmulation", {"deviceMetrics": {
            "width": width, "height": height, "pixelRatio": 3.0, "mobile": True, "touch": True}})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture(scope="module")
def sheet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 people x 100 garments: 1,615 done, 285 errors, 100 pending; one person's photo missing."""
    root = tmp_path_factory.mktemp("sheet")
    (root / "people").mkdir()
    (root / "garments").mkdir()
    out = root / "out"
    out.mkdir()
    for i in range(20):
        if i != 7:
            Image.new("RGB", (90, 120), (200, 40 + 9 * i, 40)).save(root / "people" / f"person_{i:02d}.png")
    for j in range(100):
        Image.new("RGB", (90, 120), (40, 60, 2 * j)).save(root / "garments" / f"garment_{j:03d}.png")
    for k in range(3):
        Image.new("RGB", (96, 128), (20, 80 * k, 160)).save(out / f"result_{k}.png")
    pairs = [Pair(root / "people" / f"person_{i:02d}.png", root / "garments" / f"garment_{j:03d}.png", Category.UPPER,
                  index=i * 100 + j, source=f"catalogue.csv line {i * 100 + j + 2}")
             for i in range(20) for j in range(100)]
    reports = []
    for pair in pairs[:1900]:
        if pair.index % 100 >= 85:
            reports.append(PairReport(pair, "error", "hd", seed=3, error=f"{pair.source}: garment image "
                                      f"{pair.garment}: cannot be read (a very long message that has to wrap)"))
        else:
            reports.append(PairReport(pair, "ok", "hd", outputs=[str(out / f"result_{pair.index % 3}.png")], seed=3))
    heading = Heading("ootd batch: spring catalogue", "model hd · 1 sample · 20 steps · scale 2 · 768x1024 · unipc · "
                      "seed 3 · fit pad", 1_800_000_000.0)
    write_index(out / "index.html", pairs, reports, heading, phase="interrupted")
    return out


@pytest.mark.parametrize("size", list(SIZES))
def test_the_sheet_opens_shows_its_pictures_and_never_scrolls_sideways(size: str, sheet: Path, tmp_path: Path) -> None:
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (scripts/test.sh installs them as root)")
    driver = browser(*SIZES[size])
    try:
        driver.get((sheet / "index.html").as_uri())
        assert driver.execute_script(SIDEWAYS) <= 0
        text = driver.find_element("tag name", "body").text
        assert "2000 pairs: 1615 done, 285 error, 100 pending" in text and "Interrupted" in text
        assert len(driver.find_elements("css selector", "ul.pages a")) == 10
        driver.save_screenshot(str(tmp_path / f"sheet-{size}-front.png"))

        driver.find_element("css selector", "ul.pages li:nth-child(4) a").click()  # people 6 and 7 (7: no photo)
        assert driver.execute_script(SIDEWAYS) <= 0  # the page itself: no sideways scroll
        assert driver.execute_script(GRID_SCROLLS) == [True, "auto"]  # the grid: in its own scrolling box
        assert driver.execute_script(SHOWN) >= 3  # the row headers and the first cells' results
        missing = driver.find_elements("css selector", ".missing")
        assert missing and missing[0].text == "not found"
        assert not driver.execute_script("return [...document.images].filter(i => i.complete && "
                                         "i.naturalWidth === 0 && i.getBoundingClientRect().top < innerHeight).length")
        driver.save_screenshot(str(tmp_path / f"sheet-{size}-page.png"))

        driver.get((sheet / "index_files" / "errors-0001.html").as_uri())
        assert driver.execute_script(SIDEWAYS) <= 0  # long messages wrap
        assert "catalogue.csv line 87" in driver.find_element("tag name", "body").text
        driver.save_screenshot(str(tmp_path / f"sheet-{size}-errors.png"))
    finally:
        driver.quit()
