"""Where the object store is, read once from the standard AWS variables: deltalake reads them itself,
and Spark's S3A is set from the same values, so the two engines cannot point at different stores."""

import pytest

from incremental_assets.lib.environment import is_object_store, on_object_store
from incremental_assets.lib.spark import object_store_conf

AWS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ALLOW_HTTP", "AWS_REGION", "AWS_DEFAULT_REGION",
       "AWS_VIRTUAL_HOSTED_STYLE_REQUEST")


@pytest.fixture
def aws(monkeypatch):
    for name in AWS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INCREMENTAL_ASSETS_WAREHOUSE", "s3a://bucket/warehouse")
    monkeypatch.delenv("INCREMENTAL_ASSETS_SOURCE", raising=False)
    return monkeypatch


@pytest.mark.parametrize("location, expected", [
    ("s3://bucket/w", True), ("s3a://bucket/w", True), ("gs://bucket/w", False), ("/data/w", False), ("file:///data/w", False),
])
def test_s3_and_s3a_uris_are_the_object_store(location, expected):
    assert is_object_store(location) is expected


def test_a_local_warehouse_and_source_need_no_s3a(monkeypatch, tmp_path):
    monkeypatch.setenv("INCREMENTAL_ASSETS_WAREHOUSE", str(tmp_path))
    monkeypatch.delenv("INCREMENTAL_ASSETS_SOURCE", raising=False)
    assert not on_object_store() and object_store_conf() == {}
    monkeypatch.setenv("INCREMENTAL_ASSETS_SOURCE", "s3://bucket/events")  # the source alone is enough
    assert on_object_store()


def test_s3a_follows_the_variables_deltalake_reads(aws):
    aws.setenv("AWS_ENDPOINT_URL", "https://storage.example.com:9000")
    aws.setenv("AWS_REGION", "eu-west-3")
    assert object_store_conf() == {
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.path.style.access": "true",  # deltalake's default: buckets by path
        "spark.hadoop.fs.s3a.endpoint": "https://storage.example.com:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-3",
    }
    aws.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")  # the S3-specific variable wins, as in the AWS SDKs
    aws.setenv("AWS_ALLOW_HTTP", "true")
    aws.setenv("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "true")
    conf = object_store_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "false"


def test_amazon_s3_itself_needs_no_endpoint_and_credentials_are_never_spark_settings(aws):
    aws.setenv("AWS_DEFAULT_REGION", "us-east-2")
    aws.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    aws.setenv("AWS_SECRET_ACCESS_KEY", "secret-example")
    conf = object_store_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-2" and "spark.hadoop.fs.s3a.endpoint" not in conf
    assert not any("AKIAEXAMPLE" in value or "secret-example" in value for value in conf.values())


def test_a_plain_http_endpoint_is_refused_until_accepted_by_name(aws):
    aws.setenv("AWS_ENDPOINT_URL", "http://minio.internal:9000")
    with pytest.raises(ValueError, match="http://minio.internal:9000 is plain HTTP: set AWS_ALLOW_HTTP=true"):
        object_store_conf()
