"""hearth.app: the companion app (companions, feed, Simulation Mode, encrypted storage, web UI).

Run it:

    hearth serve                                  # SQLite under ./var/, a development key created there
    hearth serve --config hearth.toml             # + the model: [[providers]] as for `hearth gateway`
    HEARTH_MASTER_KEY=... hearth serve --host 0.0.0.0 --database-url postgresql://user@db/hearth --workers 4

Layout (one job per module):

    settings.py      AppSettings, validated at start-up ([app] table of the TOML, HEARTH_* variables)
    crypto.py        AES-GCM envelope encryption: master key -> per-user data key -> each text field
    keys.py          master-key rotation (re-wrap data keys)
    storage/         SQLAlchemy 2 async engine, models, packaged alembic migrations
    startup.py       start-up checks: migrations, key rotation, refuse a master key that cannot open users' keys
    accounts.py      signup / login / sessions (argon2id)
    throttle.py      login / signup throttling in the database (shared by workers), client address, device cookies
    account.py       the user's own account: password change, export (decrypted JSON), deletion
    model.py         the seam to the gateway chain (in process), NoModel + set-up snippet
    companions.py    companions, shared context, chat turns (one transaction per turn), clearing
    relationship.py  stages from accumulated affection / trust
    textlimits.py    how long a companion's and a rehearsed person's texts may be, and max_text_chars' default
                     (both re-export hearth.companion_rules, the bottom-layer module the corpus builder uses too)
    simulation.py    the five-analyst panel, agents, rehearsals
    feed.py          posts and companion comments
    streamtext.py    the streamed message preview
    limits.py        413 body limit, security headers (Cache-Control: no-store on pages)
    deps.py          FastAPI dependencies;  routes/  one module per resource;  main.py  create_app, serve (--workers)

Operating it (keys, proxies, limits, workers, deletion on PostgreSQL): docs/app.md.
"""
