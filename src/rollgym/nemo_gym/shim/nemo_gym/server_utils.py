"""``from nemo_gym.server_utils import HEAD_SERVER_KEY_NAME, BaseServerConfig`` (NeMo RL's
import)."""

from rollgym.nemo_gym.rl import HEAD_SERVER_KEY_NAME, BaseServerConfig

__all__ = ["HEAD_SERVER_KEY_NAME", "BaseServerConfig"]
