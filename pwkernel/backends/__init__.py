"""Where islands live: ``local`` (JAX devices of this process); ``ray`` comes later."""
