"""Routes, one module per resource. ROUTERS is what create_app mounts (and what the security test
enumerates, so a new router is covered the moment it is listed here)."""

from hearth.app.routes import account, accounts, companions, feed, home, simulation

ROUTERS = [accounts.router, account.router, home.router, companions.router, simulation.router, feed.router]
