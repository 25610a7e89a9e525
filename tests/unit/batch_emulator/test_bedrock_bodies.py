"""Bedrock request checks and answers (``batch_emulator.bedrock_bodies``) taken by themselves.

How each family's body is answered through InvokeModel and in a job's records is driven through
real boto3 clients in ``test_bedrock_api.py``.
"""

from __future__ import annotations

import pytest

from batch_emulator.bedrock_bodies import model_family


@pytest.mark.parametrize(
    ("model_id", "family"),
    [
        ("anthropic.claude-3-5-haiku-20241022-v1:0", "anthropic"),
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "anthropic"),
        ("us-gov.anthropic.claude-3-haiku-20240307-v1:0", "anthropic"),
        ("arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.amazon.nova-lite-v1:0", "nova"),
        ("amazon.titan-embed-text-v2:0", "titan-embed"),
        ("amazon.titan-text-express-v1", None),
        ("meta.llama3-8b-instruct-v1:0", None),
        ("xx.anthropic.claude-3-haiku-20240307-v1:0", None),
    ],
)
def test_the_emulator_knows_each_bedrock_model_family_by_itself(model_id: str, family: str | None) -> None:
    assert model_family(model_id) == family
