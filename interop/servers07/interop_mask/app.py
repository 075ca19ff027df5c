"""A resources server of NeMo Gym 0.7's own kind, for the interop suite: it pays 1 when the
model's answer holds the row's ``expected`` text, and asks for the rollout to be masked
(``mask_sample: true``, as a server whose own infrastructure failed would) when the row says
``mask: true``. ``gym env start`` runs it from the suite's workspace in the 0.7 venv; its
``/aggregate_metrics`` is 0.7's own (means over the unmasked rows, ``coverage/*`` keys).
"""

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class MaskConfig(BaseResourcesServerConfig):
    pass


class MaskVerifyRequest(BaseVerifyRequest):
    expected: str
    mask: bool = False


class MaskVerifyResponse(BaseVerifyResponse):
    expected: str
    mask: bool = False


class MaskServer(SimpleResourcesServer):
    config: MaskConfig

    async def verify(self, body: MaskVerifyRequest) -> MaskVerifyResponse:
        text = "".join(
            getattr(part, "text", "") or ""
            for item in body.response.output
            if item.type == "message"
            for part in item.content
        )
        fields = body.model_dump() | {"mask_sample": body.mask}
        return MaskVerifyResponse(**fields, reward=float(body.expected in text))


if __name__ == "__main__":
    MaskServer.run_webserver()
