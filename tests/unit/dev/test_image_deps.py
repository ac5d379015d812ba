"""`make image-deps` asks pip about exactly what images/vllm-epd installs: the base image's vLLM and each
pin the Dockerfile passes to pip, with its ARG expanded (the resolution itself needs PyPI: `make image-deps`)."""

from __future__ import annotations

from dev.builds.image_deps import DOCKERFILE, dockerfile_args, image_requirements
from epd_operator.api import spec as api_spec


def test_the_requirements_are_the_dockerfiles_pins():
    text = DOCKERFILE.read_text()
    args = dockerfile_args(text)
    requirements = image_requirements(text)
    assert requirements[0] == "vllm==" + api_spec.DEFAULT_VLLM_IMAGE.rsplit(":v", 1)[1]
    assert f"nixl=={args['NIXL_VERSION']}" in requirements
    assert f"{args['MOONCAKE_PACKAGE']}=={args['MOONCAKE_VERSION']}" in requirements
    assert not [spec for spec in requirements if "$" in spec]


def test_an_added_pin_is_asked_about_too():
    text = DOCKERFILE.read_text().replace('"nixl==${NIXL_VERSION}"', '"nixl==${NIXL_VERSION}" "lmcache==0.4.1"')
    assert "lmcache==0.4.1" in image_requirements(text)
