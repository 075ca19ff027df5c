"""``from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig`` (NeMo RL's
import)."""

from rollgym.integrations.nemo_rl import HEAD_SERVER_KEY_NAME, BaseServerConfig

__all__ = ["HEAD_SERVER_KEY_NAME", "BaseServerConfig"]
