"""A batch's contact sheet (index.html): what it shows (heading, settings, seed, date, running / finished /
interrupted, placeholders, normalised and URL-encoded links, no column for rows without a category), pages and
error pages for big batches, timed refreshes while running, and the sheet after a batch equal to the one built
from its report. Through the CLI on FakePipe, or ContactIndex directly for the layout."""

from __future__ import annotations

import re
import shutil
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest
from PIL import Image

from ootd.app.batch import index as index_module
from ootd.app.batch import pages as pages_module
from ootd.app.batch.index import write_index
from ootd.app.batch.pages import Heading, Links, arrange
from ootd.app.batch.pairs import Pair, collect_pairs
from ootd.app.batch.report import PairReport, read_reports
from ootd.app.tryon.config import build_config
from ootd.settings import Category
from tests.helpers.cli import invoke
from tests.helpers.fakes import FakePipe, images_tree

RUN = ["--steps", "1", "--resolution", "384x512", "--seed", "11"]


class Page(HTMLParser):
    """What a browser would fetch and show: image sources, link targets, header cells, text, table cells."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.headers: list[str] = []
        self.cells = 0
        self.classes: list[str] = []
        self.meta: list[dict] = []
        self.words: list[str] = []
        self._in_th = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.classes += (found.get("class") or "").split()
        if tag == "img":
            self.images.append(found["src"] or "")
        elif tag == "a":
            self.links.append(found["href"] or "")
        elif tag == "th":
            self._in_th = True
            self.headers.append("")
        elif tag == "td":
            self.cells += 1
        elif tag == "meta":
            self.meta.append(found)

    def handle_endtag(self, tag: str) -> None:
        if tag == "th":
            self._in_th = False

    def handle_data(self, data: str) -> None:
        self.words.append(data)
        if self._in_th:
            self.headers[-1] += data

    @property
    def text(self) -> str:
        return "".join(self.words)

    @property
    def refreshes(self) -> bool:
        return any(m.get("http-equiv") == "refresh" for m in self.meta)


def page(path: Path) -> Page:
    return Page(path.read_text())


def target(folder: Path, href: str) -> Path:
    """Where a relative link leads, as a browser decodes it."""
    return folder / unquote(href)


# ---------------------------------------------------------------------------------------------- what it shows


def test_links_are_url_encoded_per_segment_html_escaped_and_lead_to_the_files(
        models, tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path) -> None:
    models.fake()
    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    shutil.move(people / "p0.png", people / "odd#1%25?.png")
    shutil.move(garments / "g0.png", garments / 'a&b"c.png')
    (tmp_path / "odd dir #2").mkdir()
    shutil.copy(example_images["tshirt"], tmp_path / "odd dir #2" / "g 1.png")
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text('people/odd#1%25?.png,"garments/a&b""c.png",upper\n'
                        "people/odd#1%25?.png,odd dir #2/g 1.png,upper\n")
    out = tmp_path / "out"
    result = invoke("batch", csv_file, "--checkpoints", tiny_tree, "-o", out, *RUN)
    assert result.exit_code == 0, result.output
    sheet = page(out / "index.html")
    assert len(sheet.images) == 2 + 2 + 1  # both results, both garments, the person
    for src in sheet.images + sheet.links:
        assert target(out, src).is_file(), src  # '#', '%', '?' encoded: the link is the file, not a fragment
    assert "../people/odd%231%2525%3F.png" in sheet.images
    assert "../odd%20dir%20%232/g%201.png" in sheet.images
    assert '"garments/a&amp;b%22c.png' not in (out / "index.html").read_text()
    assert "../garments/a%26b%22c.png" in sheet.images


def test_links_resolve_each_folder_once_and_keep_odd_bytes(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    links = Links(tmp_path / "out")
    name = b"caf\xe9.png".decode("utf-8", "surrogateescape")  # a Latin-1 file name, not UTF-8
    assert links.href(tmp_path / "x" / ".." / "out" / name) == "caf%E9.png"
    assert links.href(str(tmp_path / "a" / "b.png")) == "../a/b.png"
    assert len(links._folders) == 2
    assert Links(tmp_path / "out", "../").href(tmp_path / "a" / "b&c.png") == "../../a/b%26c.png"


def test_heading_states_and_refreshes_while_running(models, tmp_path: Path, example_images: dict[str, Path],
                                                    tiny_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "REFRESH_S", 0.0)  # a timed write as soon as a pair is in
    out = tmp_path / "out"
    seen: dict[int, Page] = {}

    class Watching(FakePipe):
        def generate(self, person, garment, settings, **kwargs):  # noqa: ANN001, ANN003, ANN201
            call = self.calls["generate"] + 1
            if call == 3:  # two pairs are in: the timer writes them without waiting for the batch's end
                deadline = time.monotonic() + 10
                while "2 done" not in page(out / "index.html").text and time.monotonic() < deadline:
                    time.sleep(0.05)
            seen[call] = page(out / "index.html")
            return super().generate(person, garment, settings, **kwargs)

    models.use(Watching)
    people, garments = images_tree(tmp_path, example_images, people=1, garments=3)
    result = invoke("batch", "--models", people, "--cloths", garments, "-k", "upper", "--checkpoints", tiny_tree,
                    "-o", out, *RUN)
    assert result.exit_code == 0, result.output
    first, third = seen[1], seen[3]
    assert first.refreshes and "Running" in first.text and "3 pairs: 0 done, 0 error, 3 pending" in first.text
    assert "3 pairs: 2 done, 0 error, 1 pending" in third.text and third.refreshes
    final = page(out / "index.html")
    assert not final.refreshes and "Finished" in final.text and "3 pairs: 3 done, 0 error, 0 pending" in final.text
    assert "ootd batch: out" in final.text
    for word in ("seed 11", "1 sample", "1 step", "384x512", "unipc", "fit pad"):
        assert word in final.text, word
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", final.text)


def test_rows_without_category_missing_inputs_and_unnormalised_paths(
        models, tmp_path: Path, example_images: dict[str, Path], tiny_tree: Path) -> None:
    models.fake()
    people, garments = images_tree(tmp_path, example_images, people=1, garments=1)
    shutil.copy(example_images["trousers"], garments / "trousers.png")
    (tmp_path / "sub").mkdir()
    csv_file = tmp_path / "pairs.csv"
    csv_file.write_text(
        "people/p0.png,sub/../garments/g0.png,upper\n"
        "people/p0.png,garments/trousers.png,sideways\n"  # an unknown category: no column of its own
        "sub/../people/nobody.png,garments/g0.png,upper\n"  # a missing person: a placeholder, no broken image
    )
    out = tmp_path / "out"
    result = invoke("batch", csv_file, "--checkpoints", tiny_tree, "-o", out, *RUN)
    assert result.exit_code == 1
    sheet = page(out / "index.html")
    headers = [h.replace("not found", "") for h in sheet.headers if h]
    assert headers == ["g0.png (upper)", "p0.png", "nobody.png"]  # one garment column, no "trousers.png (?)"
    assert all(target(out, src).is_file() for src in sheet.images)  # nothing broken
    assert "../garments/g0.png" in sheet.images and not any("sub/" in src for src in sheet.images)
    assert "missing" in sheet.classes and "not found" in sheet.text
    assert "pairs.csv line 2" in sheet.text and "pairs.csv line 3" in sheet.text  # the errors, by row
    assert "sideways" in sheet.text
    assert "/../" not in sheet.text and str(people / "nobody.png") in sheet.text


def row_cells(text: str) -> list[str]:
    """The HTML of each cell of the grid's first row of people, in column order."""
    row = text.split("</tr>")[1]
    return [part.split("</td>")[0] for part in row.split("<td>")[1:]]


@pytest.mark.parametrize("masks", ["given", "saved"])
def test_an_outfit_row_is_shown_as_an_outfit(tmp_path: Path, masks: str) -> None:
    """Its own column naming both garments (not stacked under its top's column), both masks in its cell."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    for name in ("p.png", "top.png", "jeans.png", "top_mask.png", "jeans_mask.png"):
        Image.new("RGB", (6, 8)).save(folder / name)
    given = masks == "given"
    single = Pair(folder / "p.png", folder / "top.png", Category.UPPER, folder / "top_mask.png", index=0)
    outfit = Pair(folder / "p.png", folder / "top.png", Category.UPPER, folder / "top_mask.png" if given else None,
                  index=1, garment2=folder / "jeans.png", category2=Category.LOWER,
                  mask2=folder / "jeans_mask.png" if given else None)
    saved = {} if given else {"lower_mask": str(out / "jeans_mask_saved.png"),
                              "upper_mask": str(out / "top_mask_saved.png")}
    for path in saved.values():
        Image.new("L", (3, 4)).save(path)
    reports = [done(single, out),
               PairReport(outfit, "ok", "dc+hd", outputs=[str(out / "p__top-with-jeans__0.png")], seed=1,
                          intermediates=saved)]
    Image.new("RGB", (3, 4)).save(out / "p__top-with-jeans__0.png")
    write_index(out / "index.html", [single, outfit], reports, heading())
    text = (out / "index.html").read_text()
    sheet = page(out / "index.html")
    assert [h for h in sheet.headers if h] == ["top.png (upper)", "top.png (upper) with jeans.png (lower)", "p.png"]
    plain, both = row_cells(text)
    assert "p__top__0.png" in plain and "top-with-jeans" not in plain  # nothing of the outfit under the top
    assert "p__top-with-jeans__0.png" in both
    expected = ["top_mask.png", "jeans_mask.png"] if given else ["top_mask_saved.png", "jeans_mask_saved.png"]
    for mask, garment in zip(expected, ("top.png", "jeans.png"), strict=True):
        assert f"{mask}\" alt=\"mask of {garment}\"" in both, both
    assert sum(src.endswith("jeans.png") for src in sheet.images) == 1  # the header shows both garments
    assert all(target(out, src).is_file() for src in sheet.images)


# ---------------------------------------------------------------------------------------------- big batches


def catalogue(tmp_path: Path, people: int, garments: int, missing: tuple[int, ...] = ()) -> list[Pair]:
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    for i in range(people):
        if i not in missing:
            Image.new("RGB", (6, 8)).save(folder / f"p{i}.png")
    for j in range(garments):
        Image.new("RGB", (6, 8)).save(folder / f"g{j}.png")
    return [Pair(folder / f"p{i}.png", folder / f"g{j}.png", Category.UPPER, index=i * garments + j,
                 source=f"pairs.csv line {i * garments + j + 1}") for i in range(people) for j in range(garments)]


def heading() -> Heading:
    return Heading("ootd batch: out", "model hd · seed 1", 0.0)


def done(pair: Pair, out: Path) -> PairReport:
    picture = out / f"{pair.person.stem}__{pair.garment.stem}__0.png"
    Image.new("RGB", (3, 4)).save(picture)
    return PairReport(pair, "ok", "hd", outputs=[str(picture)], seed=1)


def failed(pair: Pair) -> PairReport:
    return PairReport(pair, "error", "hd", error=f"{pair.source}: broken", seed=1)


def test_a_big_batch_is_a_small_front_page_pages_of_whole_people_and_error_pages(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pairs = catalogue(tmp_path, people=4, garments=4)
    unreadable = [Pair(Path("?"), Path("?"), None, index=16 + k, source=f"pairs.csv line {17 + k}",
                       reason="no category") for k in range(3)]
    reports = [done(p, out) if p.index % 3 else failed(p) for p in pairs] + [failed(p) for p in unreadable]
    write_index(out / "index.html", pairs + unreadable, reverse(reports), heading(), page_pairs=5, errors_per_page=3)

    front = page(out / "index.html")
    assert front.cells == 0 and not front.images  # counts and links only
    assert "19 pairs: 10 done, 9 error, 0 pending" in front.text
    grid_pages = [f"index_files/page-000{k}.html" for k in range(1, 5)]
    assert [link for link in front.links if "page-" in link] == grid_pages  # a person's 4 pairs: one page each
    assert "index_files/errors-0001.html" in front.links
    for number, link in enumerate(grid_pages):
        sheet = page(out / link)
        assert [h for h in sheet.headers if h] == [f"g{j}.png (upper)" for j in range(4)] + [f"p{number}.png"]
        assert sheet.cells == 4 and all(target(out / "index_files", src).is_file() for src in sheet.images)
        assert "../index.html" in sheet.links
    errors = [page(out / "index_files" / f"errors-000{k}.html") for k in (1, 2, 3)]
    rows = [int(n) for sheet in errors for n in re.findall(r"pairs\.csv line (\d+)", sheet.text)]
    assert rows == sorted(rows) and len(rows) == 9 and rows[-3:] == [17, 18, 19]  # by row, 3 a page
    assert not (out / "index_files" / "errors-0004.html").exists()

    # the same folder, a smaller batch: one page again, the old pages removed
    write_index(out / "index.html", pairs[:2], [], heading(), page_pairs=5)
    assert not (out / "index_files").exists()
    assert "2 pairs: 0 done, 0 error, 2 pending" in page(out / "index.html").text


def reverse(items: list) -> list:
    return items[::-1]


def test_a_sparse_grid_lists_each_persons_pairs_and_a_big_person_spans_pages(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    people = catalogue(tmp_path, people=12, garments=12, missing=(3,))
    zipped = [p for p in people if p.person.stem[1:] == p.garment.stem[1:]]  # the i-th with the i-th
    index = write_index(out / "index.html", zipped, [], heading())
    sheet = page(out / "index.html")
    assert not arrange(index.pages[0], zipped).dense
    assert sheet.cells == 12 and "pending" in sheet.text  # one cell per person, not 12 x 12
    assert sum(src.endswith("p3.png") for src in sheet.images) == 0 and "missing" in sheet.classes

    one = [Pair(people[0].person, p.garment, Category.UPPER, index=k) for k, p in enumerate(people[:12])]
    index = write_index(out / "index.html", one, [], heading(), page_pairs=5)
    assert [len(p.positions) for p in index.pages] == [5, 5, 2]
    assert all([person for _, person in arrange(p, one).people] == [one[0].person] for p in index.pages)


def test_index_after_a_batch_equals_the_one_built_from_its_report(models, tmp_path: Path, tiny_tree: Path,
                                                                  example_images: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages_module, "PAGE_PAIRS", 3)  # pages of 3 pairs: a big batch's layout on a few pairs
    monkeypatch.setattr(pages_module, "ERRORS_PER_PAGE", 2)
    monkeypatch.setattr(index_module, "REFRESH_S", 0.0)  # timed writes while it runs
    models.fake()
    people, garments = images_tree(tmp_path, example_images, people=3, garments=3)
    csv_file = tmp_path / "pairs.csv"
    rows = [f"people/p{i}.png,garments/g{j}.png,upper" for i in range(3) for j in range(3)]
    rows[4] = "people/p1.png,garments/nothing.png,upper"
    csv_file.write_text("\n".join([*rows, "people/p2.png,garments/g0.png,sideways", "a.png"]) + "\n")
    out = tmp_path / "out"
    result = invoke("batch", csv_file, "--checkpoints", tiny_tree, "-o", out, "--save-intermediates", *RUN)
    assert result.exit_code == 1, result.output

    pairs = collect_pairs(csv_file, None, None)
    config = build_config(checkpoints=tiny_tree, output=out, steps=1, resolution="384x512", seed=11,
                          save_intermediates=True)
    write_index(out / "rebuilt.html", pairs, read_reports(out / "batch_report.jsonl", pairs), Heading.of(config))

    def files(name: str) -> dict[str, str]:
        folder = out / f"{name}_files"
        found = {"front": (out / f"{name}.html").read_text()}
        found.update({p.name: p.read_text() for p in sorted(folder.iterdir())})
        state = re.compile(r'<p class="state [a-z]+">.*?</p>')
        return {key: state.sub("", text).replace(f"{name}_files/", "FOLDER/").replace(f"../{name}.html", "INDEX")
                for key, text in found.items()}

    live, rebuilt = files("index"), files("rebuilt")
    assert sorted(live) == ["errors-0001.html", "errors-0002.html", "front", "page-0001.html", "page-0002.html",
                            "page-0003.html"]
    assert live == rebuilt
    assert "Finished" in (out / "index.html").read_text()
