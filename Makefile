# The README's quick start: `make run` and `make test`.
SEED_CASE = --model qwen3.5-27b --method lora --lora-rank 16 \
  --lora-targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,in_proj_qkv,in_proj_z,out_proj \
  --optimizer adamw-8bit --checkpointing offload,gpu --loss chunked,full \
  --seq 16000,32000,48000 --gpu a100-80gb,rtx-pro-6000,h200,2xh200

.PHONY: setup run demo serve test lint bench

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/trainfit estimate $(SEED_CASE) --profile seed-000 --format markdown
	.venv/bin/trainfit estimate $(SEED_CASE) --profile default

run: demo
	@echo "To save and approve quotes, create tokens and pass them in the environment:"
	@echo "  .venv/bin/trainfit token create --role requester --name YOU"
	@echo "  .venv/bin/trainfit token create --role approver --name APPROVER"
	@echo "  TRAINFIT_REQUESTER_TOKENS='YOU=sha256:...' TRAINFIT_APPROVER_TOKENS='APPROVER=sha256:...' make serve"
	.venv/bin/trainfit serve --host 127.0.0.1 --port 8000

serve: setup
	.venv/bin/trainfit serve --host 127.0.0.1 --port 8000

lint: setup
	.venv/bin/ruff check .

test: setup
	.venv/bin/ruff check .
	.venv/bin/mypy estimator gpu_catalog app memtest_schema trainfit probe
	.venv/bin/python -m pytest
	.venv-torchtune/bin/python -m pytest tests/probe/test_torchtune_stack.py tests/estimator/test_optimizer_4bit.py

bench: setup
	.venv/bin/python bench/speed.py
	.venv/bin/python bench/sweep_speed.py
	.venv/bin/python bench/peers.py
