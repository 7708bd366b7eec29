"""Browser-facing security of the one app: Host/Origin checks (DNS rebinding, cross-site
requests), sign-in with a token into a server-side session, CSRF, and a trusted SSO proxy mode.

* ``config``      the settings these read (``WebAuthConfig``), in one small typed class
* ``hosts``       pure decisions: is this Host allowed, is this request cross-site
* ``identity``    who is calling when no bearer token is sent: session cookie or SSO proxy headers
* ``middleware``  the ASGI layer that applies the checks and records the identity in the scope
* ``routes``      sign-in page, ``/api/v1/auth/*`` (sign in, sign out, who am I)

Handlers keep asking ``storage.tokens.authorize`` for a role; it takes the identity this
layer found (``scope["gpufleet.identity"]``) as well as a bearer header."""
