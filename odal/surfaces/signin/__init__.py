"""Sign-in to the admin (issue 41): the lock on guessed passwords (lockout), single sign-on (sso),
the login page and the session's end (pages). An app of its own, above odal's foundation."""
