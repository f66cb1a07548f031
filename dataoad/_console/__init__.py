"""The operator console (``dataoad serve``, the ``console`` extra): a queue, receipts, the audit.

Private: the command line is its interface. ``app`` builds the ASGI app,
``security`` holds the token, session, CSRF and header rules, ``views`` the
pages and their JSON twins, ``actions`` the three verbs a team may run.
"""
