"""What tests share: the repository's paths, CLI invocation and error checks (cli.py), an instant stand-in
pipeline and the model seam (fakes.py), pixel readers (images.py), synthetic pose and parsing (synthetic.py), a
live server (serving.py), small UNets (small_unets.py), the metric networks' stand-ins with folders of images to
measure (evaluation.py), and small training sets and adapters (training.py)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def traceback_length(exc: BaseException) -> int:
    """How many frames an exception's traceback holds (each keeps its frame's locals alive)."""
    count, tb = 0, exc.__traceback__
    while tb is not None:
        count, tb = count + 1, tb.tb_next
    return count
