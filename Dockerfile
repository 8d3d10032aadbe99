# The image docker-compose.yml runs: synclane with its Prefect extra, the demo and flows/.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY synclane ./synclane
COPY flows ./flows
RUN pip install --no-cache-dir '.[prefect]'
ENV PYTHONUNBUFFERED=1
CMD ["synclane", "--help"]
