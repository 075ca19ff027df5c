"""reasoning-gym's procedural datasets as a rollgym environment: rows made offline by seed
(``rollgym tasks reasoning-gym``), answers scored by each dataset's own ``score_answer``."""
