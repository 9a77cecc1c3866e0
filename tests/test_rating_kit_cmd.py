"""``captioner rating-kit`` on real checkpoints and the synthetic Karpathy split."""

from __future__ import annotations

import json
import shutil

from eval.commands import rating_kit as command

FAST = ["--beam-size", "1", "--max-length", "4", "--no-progress"]


def test_kit_from_karpathy_split_with_key_outside(tiny_checkpoint, synthetic_data, tmp_path,
                                                  capsys):
    other = tmp_path / "models" / "model-zeta.ckpt"
    other.parent.mkdir()
    shutil.copy(tiny_checkpoint, other)
    out = tmp_path / "kit"
    args = ["--ckpt", str(tiny_checkpoint), "--ckpt", str(other), "--split", "test",
            "--data", str(synthetic_data.karpathy_json), "--images",
            str(synthetic_data.image_root), "--seed", "3", "--out", str(out), *FAST]
    assert command.main([*args, "--n", "3"]) == 0
    key = json.loads((tmp_path / "kit-key.json").read_text())
    assert [m["name"] for m in key["models"]] == [tiny_checkpoint.stem, "model-zeta"]
    assert len(key["images"]) == 3 and len({i["key"] for i in key["images"]}) == 3
    page = (out / "index.html").read_text()
    assert key["kit_id"] in page and "model-zeta" not in page
    assert len(list((out / "images").iterdir())) == 3

    assert command.main([*args, "--n", "99"]) == 2
    assert "--n 99 but only 4 images" in capsys.readouterr().err
