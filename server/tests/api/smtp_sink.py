"""A mail server for the tests: takes every message over SMTP (aiosmtpd, from PyPI) and
prints it as one JSON line. The first line printed is the port it listens on."""

import asyncio
import json

from aiosmtpd.smtp import SMTP


class Sink:
    async def handle_DATA(self, server, session, envelope):
        print(
            json.dumps(
                {
                    "from": envelope.mail_from,
                    "to": envelope.rcpt_tos,
                    "data": envelope.content.decode("utf8", "replace"),
                }
            ),
            flush=True,
        )
        return "250 OK"


async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(Sink()), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


asyncio.run(main())
