"""S3 keys are strings, not paths: two keys may name one file on disk."""

from __future__ import annotations

import pytest

from tests.support.cli import clean_env, error_lines, kubetune


@pytest.mark.parametrize("twin", ["m/./model.safetensors", "m//model.safetensors"])
def test_keys_that_name_one_file_are_refused_naming_both(s3, tiny_model_dir, tmp_path, twin):
    client = s3.client()
    bucket = "twins-dot" if "/./" in twin else "twins-slash"
    client.create_bucket(Bucket=bucket)
    client.upload_file(str(tiny_model_dir / "config.json"), bucket, "m/config.json")
    client.upload_file(str(tiny_model_dir / "model.safetensors"), bucket, "m/model.safetensors")
    client.put_object(Bucket=bucket, Key=twin, Body=b"another object, same path")
    assert twin in {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    out = tmp_path / "model"
    result = kubetune("init-model", env=clean_env(
        **s3.env(), STORAGE_URI=f"s3://{bucket}/m", OUTPUT_PATH=str(out),
        KUBETUNE_TERMINATION_LOG=str(tmp_path / "termination-log")), timeout=120)
    assert result.returncode == 65, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1
    assert "'m/model.safetensors'" in lines[0] and repr(twin) in lines[0]
    assert "name the same file 'model.safetensors'" in lines[0]
    assert not out.exists()
