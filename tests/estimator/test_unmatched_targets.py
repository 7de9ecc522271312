"""Target names a model lacks: peft leaves them out while another target matches and raises
only when none does (peft 0.21.2 tuners/tuners_utils.py:1051-1071); trainfit prices the same
adapters and names the left-out targets in the document's model notes. axolotl's GLM-4.7-Flash
examples (examples/glm47-flash/qlora.yaml) name q_proj, k_proj, v_proj, o_proj on an MLA model
where only o_proj exists; trainfit refused them before."""

from __future__ import annotations

import warnings

import pytest

from estimator.architectures import spec_from_config
from estimator.document import estimate_document
from estimator.errors import EstimatorInputError
from estimator.lora import lora_params
from estimator.request import EstimateRequest
from estimator.setup import TrainingSetup
from tests.estimator.test_architectures import TINY

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize("model_type", ["deepseek_v3", "glm4_moe_lite"])
def test_names_the_model_lacks_are_left_out_as_peft_does(model_type: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = transformers.CONFIG_MAPPING[model_type](**TINY[model_type])
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(config)
        wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=ATTENTION))
    expected = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    spec = spec_from_config(config.to_dict())
    setup = TrainingSetup(method="lora", lora_rank=4, lora_targets=ATTENTION)
    assert lora_params(spec, setup) == expected > 0


def test_the_document_names_the_left_out_targets_and_all_unmatched_is_an_error() -> None:
    config = {**TINY["glm4_moe_lite"], "model_type": "glm4_moe_lite"}
    body = {
        "model": {"config": config},
        "setup": {"method": "lora", "lora_targets": ATTENTION},
        "seq_lens": [1024],
        "gpus": ["h100-80gb"],
    }
    doc = estimate_document(EstimateRequest.model_validate(body))
    notes = [n for n in doc["model"]["notes"] if n.startswith("lora_targets")]
    assert len(notes) == 1 and "q_proj, k_proj, v_proj:" in notes[0]
    assert "o_proj" not in notes[0].split(":")[0]
    spec = spec_from_config(config)
    with pytest.raises(EstimatorInputError) as err:
        lora_params(spec, TrainingSetup(method="lora", lora_targets=["q_proj", "k_proj"]))
    assert err.value.field == "setup.lora_targets" and "'q_proj'" in str(err.value)
