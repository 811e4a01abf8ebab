"""The text tower's size for the memory plan (`--category auto`), from a CLIP config without loading it, equals
the parameters of the stock tower built from that config."""

from __future__ import annotations

import pytest

from ootd.memory.sizes import classifier_lines, clip_text_parameters


@pytest.mark.parametrize(("hidden", "inner", "layers", "projection"), [(32, 37, 2, 16), (48, 64, 3, 48)])
def test_text_parameters_equal_the_stock_tower(hidden: int, inner: int, layers: int, projection: int) -> None:
    from transformers import CLIPConfig, CLIPTextConfig, CLIPTextModelWithProjection, CLIPVisionConfig

    text = CLIPTextConfig(hidden_size=hidden, intermediate_size=inner, num_hidden_layers=layers,
                          num_attention_heads=4, vocab_size=99, max_position_embeddings=20, projection_dim=projection)
    vision = CLIPVisionConfig(hidden_size=32, num_attention_heads=4)
    config = CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=projection)
    tower = CLIPTextModelWithProjection(config.text_config)
    assert clip_text_parameters(config.to_dict()) == sum(p.numel() for p in tower.parameters())


def test_classifier_line_gives_fp32_bytes() -> None:
    (line,) = classifier_lines(2**28)  # 2^28 parameters x 4 bytes = 1 GiB
    assert "1.00 GiB" in line and "268,435,456 parameters" in line
    (small,) = classifier_lines(2_500_000)  # a tiny tower: 9.5 MiB, not "0.01 GiB"
    assert "9.5 MiB" in small and "GiB" not in small
