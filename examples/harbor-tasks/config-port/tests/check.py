from pathlib import Path
want = "[database]\nhost = db.local\nport = 5432\n\n[server]\nhost = 0.0.0.0\nport = 8080\nworkers = 4\n\n[metrics]\nport = 9100\n"
assert Path("/app/config.ini").read_text() == want
