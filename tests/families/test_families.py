"""The family registry: detection from a directory, one-line refusals, names the CLI offers."""
import json

import pytest

from engine.errors import ModelFormatError
from engine.families import FAMILIES, detect, family


def test_the_cli_offers_every_family():
    from voiceapp.cli.model import FAMILY_NAMES

    assert FAMILY_NAMES == tuple(FAMILIES)


def test_an_empty_folder_is_no_family_and_names_what_each_needs(tmp_path):
    with pytest.raises(ModelFormatError) as err:
        detect(tmp_path)
    assert "\n" not in str(err.value) and all(name in str(err.value) for name in FAMILIES)


def test_a_spark_llm_beside_a_snac_decoder_is_a_mix(tmp_path):
    (tmp_path / "config.yaml").write_text("sample_rate: 16000\n")
    (tmp_path / "BiCodec").mkdir()
    (tmp_path / "snac").mkdir()
    with pytest.raises(ModelFormatError, match="several model families"):
        detect(tmp_path)


def test_a_llama_folder_is_orpheus_and_a_spark_layout_is_spark(tmp_path):
    llama, spark = tmp_path / "llama", tmp_path / "spark"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    spark.mkdir()
    (spark / "config.yaml").write_text("sample_rate: 16000\n")
    assert detect(llama).name == "orpheus" and detect(spark).name == "spark"
    assert family("orpheus").sample_rate == 24000 and family("spark").sample_rate == 16000


def test_asking_which_family_a_folder_is_imports_no_numpy(tmp_path):
    """`say`'s lean road asks (for the voices) before its first audio, and imports no numpy before that."""
    import subprocess
    import sys

    (tmp_path / "config.yaml").write_text("sample_rate: 16000\n")
    code = ("import sys; from engine.families import family_of; "
            f"family_of({str(tmp_path)!r}).voices().all(); print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
